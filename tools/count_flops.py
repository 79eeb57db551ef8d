#!/usr/bin/env python
"""Parameters and GFLOPs of SR-ViT: the variants as classifiers (the paper's Table 2), and the
shipped Mask R-CNN and UPerNet configs as whole models (its Table 4).

    python tools/count_flops.py                      # every variant at 224x224 (Table 2)
    python tools/count_flops.py --size 512 --models srvit_s_t3 srvit_deit_s
    python tools/count_flops.py --num-classes 0 --size 1024   # backbone only
    python tools/count_flops.py --task detection     # every shipped detectron2 config (Table 4)
    python tools/count_flops.py --task detection --framework mmdet   # every shipped mmdet config
    python tools/count_flops.py --task segmentation --configs upernet_srvit_s.py upernet_deit_s.py
    python tools/count_flops.py --task detection --json > detection.json
    python tools/count_flops.py --task detection --configs cascade/ lvis/mask_rcnn_srvit_s_t3.py  # a folder's configs
    python tools/count_flops.py --task detection --framework mmdet --configs cascade/cascade_mask_rcnn_srvit_s_t3_lsj.py
"""
import argparse
import json
import sys

import srvit_backbones
from srvit_backbones.analysis import flops_table
from srvit_backbones.analysis.flops import Counted
from srvit_backbones.frameworks import TASKS, adapter, frameworks
from srvit_backbones.frameworks import framework as framework_row
from srvit_backbones.models import VARIANTS


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=f"{__doc__}\n{flops_table.__doc__}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=TASKS, default="classification",
                        help="classification: the variants (Table 2); detection / segmentation: the shipped "
                             "configs as whole models (Table 4)")
    parser.add_argument("--models", nargs="+", default=list(VARIANTS), help="classification: variant names")
    parser.add_argument("--size", type=int, nargs="+", default=[224], help="classification: input size, S or H W")
    parser.add_argument("--num-classes", type=int, default=1000, help="classification: classifier size (0: backbone)")
    parser.add_argument("--configs", nargs="+", metavar="CONFIG",
                        help="detection / segmentation: config names (FOLDER/NAME.py in a subfolder; FOLDER/ for "
                             "all of its configs) or paths (default: every shipped one of the top folder)")
    defaults = {task: frameworks(task)[0] for task in TASKS if frameworks(task)}
    parser.add_argument("--framework", choices=frameworks(), help=f"{' / '.join(defaults)}: whose configs "
                        f"(default: {' / '.join(defaults.values())})")
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list instead of a table")
    parser.add_argument("--plain", action="store_true",
                        help="trace every model whole (every block application, the heads of every config): "
                             "the same figures, slower; a check of the shortcuts")
    return parser.parse_args(argv)


def table4_rows(args):
    """Each config's row from its framework's adapter (the task's first framework by default)."""
    choices = frameworks(args.task)
    framework = args.framework or choices[0]
    if framework not in choices:
        sys.exit(f"--framework {framework} has no {args.task} configs; "
                 f"choose {' or '.join(choices) or 'no --framework (the variants)'}")
    if not args.configs and framework_row(framework).config_folder is None:
        sys.exit(f"--framework {framework} ships no configs: name them with --configs")
    names = args.configs or srvit_backbones.list_configs(framework)
    try:
        # a shipped folder ("cascade/") stands for its configs
        names = [n for name in names for n in (srvit_backbones.list_configs(framework, name)
                                               if name.endswith("/") else [name])]
        paths = [srvit_backbones.resolve_config(framework, name) for name in names]
    except FileNotFoundError as e:
        sys.exit(str(e))
    counted = Counted()
    return [adapter(framework).count_flops(path, counted, args.plain) for path in paths]


def main(argv=None):
    args = parse_args(argv)
    if args.task == "classification" and not args.framework:
        try:
            rows = flops_table.classification_rows(args.models, args.size, args.num_classes, args.plain)
        except ValueError as e:
            sys.exit(str(e))
    else:
        rows = table4_rows(args)
    print(json.dumps(rows, indent=2) if args.json else flops_table.format_table(rows, args.task))
    return rows


if __name__ == "__main__":
    main()
