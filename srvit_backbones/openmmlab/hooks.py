"""``Fp16CompressionHook``: gradients all-reduced in fp16 under DDP, detectron2's
``train.ddp.fp16_compression`` (ViTDet's recipe) for mmengine runners."""
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel


class Fp16CompressionHook(Hook):
    """Registers torch's ``fp16_compress_hook`` on the runner's DDP model before training; a
    non-distributed run is left as it is. A wrapper that is not torch's DDP (FSDP, DeepSpeed)
    is an error rather than a silently uncompressed run."""

    def before_train(self, runner) -> None:
        model = runner.model
        if not is_model_wrapper(model):
            return
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(f"Fp16CompressionHook needs torch's DistributedDataParallel (mmengine's "
                            f"MMDistributedDataParallel); the model is wrapped in {type(model).__name__}: "
                            f"remove the hook from custom_hooks")
        model.register_comm_hook(state=None, hook=fp16_compress_hook)
