"""Datasets: the data check before a run, LVIS v1 helpers, the generated COCO / LVIS / ADE20K datasets."""
