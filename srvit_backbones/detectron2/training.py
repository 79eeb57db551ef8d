"""What tools/train_net.py and the benchmarks share: a LazyConfig by path or shipped name with
its overrides, its model and optimizer, and the trainer it asks for: detectron2's
``SimpleTrainer``, or with ``train.amp.enabled`` its ``AMPTrainer`` on ``train.device``
(``DeviceAMPTrainer``) in the dtype of the package's mixed-precision rule (``srvit_backbones.amp``)."""
import time

import torch
from detectron2.config import LazyConfig, instantiate
from detectron2.engine import AMPTrainer, SimpleTrainer
from detectron2.utils.events import get_event_storage

from .. import amp
from ..config_files import resolve_config
from .custom_data import use_coco_files

#: ``train.amp.precision``: the autocast dtype named, as ``--amp`` names it (left out: the device's)
AMP_PRECISIONS = ("fp16", "bf16")


def load_config(config_file, opts=(), coco_train=None, coco_val=None):
    """The config named by ``config_file`` (a path or a shipped name such as
    ``mask_rcnn_srvit_s_t3.py``) with its ``key=value`` overrides; FileNotFoundError naming
    the shipped configs when there is none. ``coco_train`` / ``coco_val``: (json_file,
    image_root) of a COCO-format dataset to train and evaluate on (``custom_data.use_coco_files``),
    applied before the overrides."""
    cfg = LazyConfig.load(resolve_config("detectron2", config_file))
    if coco_train:
        use_coco_files(cfg, coco_train, coco_val)
    elif coco_val:
        raise ValueError("--coco-val needs --coco-train (the training split sizes the head)")
    return LazyConfig.apply_overrides(cfg, list(opts))


def build_model(cfg, device=None):
    """``cfg.model`` on ``device`` (default: ``cfg.train.device``)."""
    return instantiate(cfg.model).to(device or cfg.train.device)


def build_optimizer(cfg, model):
    """``cfg.optimizer`` over ``model``'s parameters (the config's parameter groups)."""
    cfg.optimizer.params.model = model
    return instantiate(cfg.optimizer)


def autocast_dtype(cfg):
    """The autocast dtype the trainer runs ``cfg.train.amp`` in on ``cfg.train.device``
    (``srvit_backbones.amp.resolve_precision`` decides), or None for fp32 (without
    ``train.amp.enabled``). ``train.amp.enabled=True`` alone is ``--amp auto``: fp16 on CUDA, as
    detectron2's AMPTrainer, bf16 on a CPU with native bf16. ``train.amp.precision`` ('fp16' /
    'bf16') names the dtype (on a CPU without it natively it runs, slower than fp32, with a
    warning); it is checked whether or not ``train.amp.enabled`` is set, so a typo is an error
    either way, but used only when it is. A ValueError naming the fix, in the config's keys, where
    there is no dtype."""
    precision = cfg.train.amp.get("precision", None)
    if precision is not None and precision not in AMP_PRECISIONS:  # a typo is an error, switched on or not
        raise ValueError(f"train.amp.precision={precision!r} is not one of {AMP_PRECISIONS}: name the autocast dtype "
                         f"(train.amp.precision=fp16 or bf16), or leave it out for the device's (fp16 on CUDA, bf16 "
                         f"on a CPU with native bf16); for fp32 pass train.amp.enabled=False")
    if not cfg.train.amp.enabled:
        return None
    device = cfg.train.get("device", "cuda")
    try:
        return amp.resolve_precision(device, precision or "auto")
    except ValueError as e:  # the rule's reason, with the fix in this config's keys
        if torch.device(device).type == "cpu":
            raise ValueError("train.amp.enabled=True on the CPU trains bf16, but this CPU has no native bf16 "
                             "(AVX512-BF16 or AMX) and emulated bf16 is slower than fp32: pass "
                             "train.amp.enabled=False (fp32), or name the dtype to run it all the same "
                             "(train.amp.precision=bf16 or fp16, slower than fp32)") from e
        raise ValueError(f"train.amp.enabled=True runs on train.device cuda or cpu, got {device!r}: pass "
                         f"train.amp.enabled=False") from e


class DeviceAMPTrainer(AMPTrainer):
    """detectron2's ``AMPTrainer`` on the device type ``device_type`` ('cuda', 'cpu'): its
    arguments and ``state_dict`` (the scaler under "grad_scaler": a checkpoint of either resumes
    into the other), its GradScaler, of ``device_type`` (``torch.amp.GradScaler(device_type)`` by
    default, for every precision as AMPTrainer's: bf16 needs no loss scaling, but a scaler's
    state kept in every checkpoint lets a run resume in either dtype), and its ``run_step``,
    autocast to ``precision`` on ``device_type``. On CUDA it is AMPTrainer; on a CPU it runs the
    GPU's code path (fp16's loss scaling and skipped steps included, in tests) or bf16 where the
    CPU has it natively, where AMPTrainer asserts CUDA and makes CUDA's GradScaler (off without
    CUDA).

    ``run_step`` repeats detectron2 0.7.2's ``AMPTrainer.run_step``
    (detectron2/engine/train_loop.py), which asserts ``torch.cuda.is_available()`` and enters
    ``torch.cuda.amp.autocast``: the same statements, with ``torch.autocast(device_type)`` and
    without the assertion, because there is nothing narrower to override (the autocast wraps the
    forward only); a test compares the two statement by statement against the installed detectron2.
    """

    def __init__(self, model, data_loader, optimizer, gather_metric_period=1, zero_grad_before_forward=False,
                 grad_scaler=None, precision: torch.dtype = torch.float16, log_grad_scaler: bool = False,
                 async_write_metrics=False, device_type: str = "cuda"):
        if grad_scaler is None:
            grad_scaler = torch.amp.GradScaler(device_type)
        super().__init__(model, data_loader, optimizer, gather_metric_period, zero_grad_before_forward, grad_scaler,
                         precision, log_grad_scaler, async_write_metrics)
        self.device_type = device_type

    def run_step(self):
        assert self.model.training, "[AMPTrainer] model was changed to eval mode!"
        start = time.perf_counter()
        data = next(self._data_loader_iter)
        data_time = time.perf_counter() - start

        if self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        with torch.autocast(self.device_type, dtype=self.precision):
            loss_dict = self.model(data)
            if isinstance(loss_dict, torch.Tensor):
                losses = loss_dict
                loss_dict = {"total_loss": loss_dict}
            else:
                losses = sum(loss_dict.values())

        if not self.zero_grad_before_forward:
            self.optimizer.zero_grad()

        self.grad_scaler.scale(losses).backward()

        if self.log_grad_scaler:
            storage = get_event_storage()
            storage.put_scalar("[metric]grad_scaler", self.grad_scaler.get_scale())

        self.after_backward()

        if self.async_write_metrics:
            self.concurrent_executor.submit(self._write_metrics, loss_dict, data_time, iter=self.iter)
        else:
            self._write_metrics(loss_dict, data_time)

        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()


def build_trainer(cfg, model, data_loader, optimizer):
    """The trainer tools/train_net.py runs: with ``train.amp.enabled``, ``DeviceAMPTrainer`` on
    ``train.device``'s type in ``autocast_dtype(cfg)``; else detectron2's ``SimpleTrainer``."""
    dtype = autocast_dtype(cfg)
    if dtype is None:
        return SimpleTrainer(model, data_loader, optimizer)
    return DeviceAMPTrainer(model, data_loader, optimizer, precision=dtype,
                            device_type=torch.device(cfg.train.device).type)
