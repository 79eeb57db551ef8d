"""detectron2's row of the framework table (``srvit_backbones.frameworks``)."""
from ..frameworks import FrameworkAdapter


class Detectron2Adapter(FrameworkAdapter):
    """LazyConfigs (and the config.yaml tools/train_net.py saves), detectron2's
    ``DefaultPredictor`` and ``Visualizer``, fvcore's counts, tools/train_net.py's data check."""

    checkpoint_hint = ("give the model_final.pth that tools/train_net.py wrote with this config and the same "
                       "overrides (a pretraining checkpoint holds only the backbone: train the detector first)")

    def load_config(self, path, opts=()):
        from detectron2.config import LazyConfig

        cfg = LazyConfig.load(path)
        if "model" not in cfg:
            raise ValueError(f"{path} is not a detectron2 LazyConfig (it has no 'model'; a yacs config?): the tools "
                             f"read LazyConfigs, .py files or the config.yaml that tools/train_net.py saves")
        return LazyConfig.apply_overrides(cfg, list(opts))

    def build_demo(self, cfg, checkpoint, device="cpu", amp=False, score_threshold=0.5, opacity=0.5):
        from .demo import Detectron2Demo

        return Detectron2Demo(cfg, checkpoint, device, amp, score_threshold, self.checkpoint_hint)

    def count_flops(self, path, counted, plain=False):
        from .flops import count_detector

        return count_detector(path, counted, plain)

    def check_data(self, path, args):
        from .validate import check_config_data

        check_config_data(path, args.opts, args.coco_train, args.coco_val)

    def time_training(self, config, size, images, device, warmup, steps):
        import torch

        from .benchmark import trainer_steps

        mixed = torch.device(device).type == "cuda"  # AMPTrainer's: fp32 elsewhere
        opts = [f"model.backbone.net.img_size={size}", f"model.backbone.square_pad={size}",
                f"train.device={device}", f"train.amp.enabled={mixed}"]
        return trainer_steps(config, opts, images=images, warmup=warmup, steps=steps)
