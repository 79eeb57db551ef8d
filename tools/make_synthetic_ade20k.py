#!/usr/bin/env python
"""Write a small segmentation dataset in ADE20K's layout (what mmseg's ADE20KDataset reads):

    ROOT/ade/ADEChallengeData2016/images/{training,validation}/*.jpg
    ROOT/ade/ADEChallengeData2016/annotations/{training,validation}/*.png

Labels follow ADE20K: 0 = "other" (ignored with reduce_zero_label=True), 1..150 = classes.
Each image is a textured background (label 1, "wall") with a few filled shapes whose
class sets both the shape and its colour (labels 2..NUM_SHAPE_CLASSES+1), so a model can
learn the segments:

    python tools/make_synthetic_ade20k.py --root datasets --train 32 --val 8

With ``--classes BACKGROUND A B C D`` it writes a dataset of your own instead, in the layout of
mmseg's custom datasets: label 0 the background, 1..4 the shapes, 255 the unlabelled border
(reduce_zero_label=False), and a class file (one ``NAME R G B`` line per label):

    ROOT/images/{train,val}/*.jpg   ROOT/labels/{train,val}/*.png   ROOT/classes.txt
"""
from srvit_backbones.data.synthetic import ade20k


def main(argv=None):
    args = ade20k.parse_args(argv, __doc__)
    base = ade20k.write_dataset(args)
    print(f"wrote {args.train} training and {args.val} validation samples under {base}")


if __name__ == "__main__":
    main()
