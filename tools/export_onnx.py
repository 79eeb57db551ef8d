#!/usr/bin/env python
"""Export the dense SR-ViT backbone to ONNX (dynamic batch, height and width) and check it
with ONNX Runtime against PyTorch at two input sizes; the logic is ``srvit_backbones.analysis.export``.

    python tools/export_onnx.py --model srvit_s_t3 --checkpoint output/pretrain/best.pth --output srvit_s_t3.onnx
    python tools/export_onnx.py --model srvit_s_t3 --checkpoint output/model_final.pth --output det_backbone.onnx
    python tools/export_onnx.py --model srvit_s_t3 --checkpoint work_dirs/upernet_srvit_s/iter_160000.pth \
        --output seg_backbone.onnx --check-sizes 512x512 384x640
    python tools/export_onnx.py --model srvit_t_t2 --random-weights --output random.onnx --set num_steps=3
    python tools/export_onnx.py --model srvit_s_t3 --checkpoint output/pretrain/best.pth --output s_t3.onnx --amp

Needs ``pip install -e .[deploy]`` (onnx, onnxscript, onnxruntime). Exits with an error if
ONNX Runtime's outputs differ from PyTorch's beyond ``--atol`` + ``--rtol`` * the output's
largest magnitude. ``--amp`` keeps the exported graph fp32 and adds to the check the PyTorch
model under bf16 autocast on the CPU (where the CPU has native bf16), printing its difference
to the fp32 ONNX outputs: what bf16 inference would cost in accuracy.
"""
from srvit_backbones.analysis import export
from srvit_backbones.errors import tool_main

main = tool_main(export.main, prefix="error: ")

if __name__ == "__main__":
    main()
