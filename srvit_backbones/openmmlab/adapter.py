"""What the mmdet and mmseg rows of the framework table (``srvit_backbones.frameworks``) share."""
import argparse

from ..frameworks import FrameworkAdapter


class OpenMMLabAdapter(FrameworkAdapter):
    """An mmengine-config framework; ``tools`` is its ``srvit_backbones.<framework>.tools`` module."""

    tools = None

    def load_config(self, path, opts=()):
        from mmengine.config import Config, DictAction

        cfg = Config.fromfile(path)
        if opts:
            parsed = argparse.Namespace()
            DictAction(option_strings=["--opts"], dest="opts")(None, parsed, list(opts))
            cfg.merge_from_dict(parsed.opts)
        return cfg

    def check_data(self, path, args):
        args.config, args.launcher, args.work_dir, args.local_rank = path, "none", None, 0
        self.tools.check_data(self.tools.load_config(args), ("train_dataloader", "val_dataloader", "test_dataloader"),
                              read_files=True)
