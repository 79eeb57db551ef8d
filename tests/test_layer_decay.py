"""The shared-block layer-id rule (SPEC section 6) on SR-ViT-S T=3."""
import pytest

from srvit_backbones import create_srvit
from srvit_backbones.layer_decay import layer_depth, layer_id, lr_decay_factor

SIZES_S = [1, 4, 3, 2, 1, 1]  # S-R4-R3-R2-R1-S: 12 unique blocks


@pytest.mark.parametrize("name,expected", [
    ("cls_token", 0), ("pos_embed", 0), ("patch_embed.proj.weight", 0), ("dist_token", 0),
    ("units.0.blocks.0.attn.qkv.weight", 1),          # first ordinary block
    ("units.1.blocks.0.norm1.weight", 2),              # R4: unique blocks 2..5
    ("units.1.blocks.3.mlp.fc2.bias", 5),
    ("units.1.router.weight", 5),                      # router: the unit's last block
    ("units.1.step_transforms.1.weight", 5),
    ("units.2.blocks.0.attn.proj.weight", 6),          # R3: 6..8
    ("units.2.router.bias", 8),
    ("units.3.blocks.1.norm2.weight", 10),             # R2: 9..10
    ("units.4.blocks.0.attn.qkv.bias", 11), ("units.4.step_transforms.0.bias", 11),  # R1
    ("units.5.blocks.0.mlp.fc1.weight", 12),           # last ordinary block
    ("norm.weight", 13), ("head.weight", 13),
])
def test_layer_ids(name, expected):
    assert layer_id(name, SIZES_S) == expected


def test_prefix_and_non_backbone_parameters():
    assert layer_id("backbone.net.srvit.units.1.router.weight", SIZES_S, "backbone.net.srvit.") == 5
    assert layer_id("roi_heads.box_head.fc1.weight", SIZES_S, "backbone.net.srvit.") == 13
    assert layer_id("backbone.simfp_2.0.weight", SIZES_S, "backbone.net.srvit.") == 13
    assert layer_depth("units.0.blocks.0.attn.qkv.weight", SIZES_S) == (1, 14)


def test_every_parameter_of_srvit_s_t3_gets_its_factor():
    model = create_srvit("srvit_s_t3", num_classes=0, img_size=32)
    assert model.unit_sizes == SIZES_S
    factors = {n: lr_decay_factor(n, 0.7, model.unit_sizes) for n, _ in model.named_parameters()}
    assert factors["pos_embed"] == pytest.approx(0.7 ** 13)
    assert factors["units.0.blocks.0.norm1.weight"] == pytest.approx(0.7 ** 12)
    assert factors["units.1.router.weight"] == factors["units.1.blocks.3.attn.qkv.weight"] == pytest.approx(0.7 ** 8)
    assert factors["units.5.blocks.0.mlp.fc2.weight"] == pytest.approx(0.7)
    assert factors["norm.weight"] == 1.0
    # every block parameter's factor follows its unique-block position
    block_index = 0
    for u, unit in enumerate(model.units):
        for k in range(len(unit.blocks)):
            block_index += 1
            for n, _ in unit.blocks[k].named_parameters():
                assert factors[f"units.{u}.blocks.{k}.{n}"] == pytest.approx(0.7 ** (13 - block_index))
    assert model.get_layer_depth("units.3.router.weight") == (10, 14)


def test_unknown_unit_is_an_error():
    with pytest.raises(ValueError, match="unit 9"):
        layer_id("units.9.blocks.0.norm1.weight", SIZES_S)
