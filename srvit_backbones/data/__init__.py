"""Datasets: the data check every training tool runs first, LVIS v1 helpers and the generated (synthetic) COCO,
LVIS and ADE20K datasets of the quickstarts and tests."""
