# The README's two commands: `make setup`, then `make test`.
PY ?= .venv/bin/python
export OMP_NUM_THREADS ?= 2

.PHONY: setup test lint collect-env gpu-check quickstart-detectron2 quickstart-detectron2-win quickstart-mmseg quickstart-mmdet \
	demo-detectron2 demo-mmseg demo-mmdet

setup:
	bash tools/setup.sh

# pytest-xdist: TEST_WORKERS processes, a test file each at a time (its module fixtures built
# once), one torch thread each; TEST_WORKERS=0 runs the suite in this process
TEST_WORKERS ?= 2

test:
	@test -x $(PY) || { echo "no environment at $(PY): run 'make setup' first (or PY=python make test)"; exit 1; }
	OMP_NUM_THREADS=$(if $(filter 0,$(TEST_WORKERS)),$(OMP_NUM_THREADS),1) $(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadfile --durations=15

# ruff (ruff.toml): pyflakes, pycodestyle, isort and bugbear over the whole tree; .ci/run runs it
lint:
	@test -x $(PY) || { echo "no environment at $(PY): run 'make setup' first"; exit 1; }
	$(PY) -m ruff check .

collect-env:
	$(PY) -m srvit_backbones.collect_env

# on a GPU machine: (a)-(g) of tools/gpu_check.py (g: torch.compile against eager) and the CUDA-marked tests;
# without CUDA, (e) only
gpu-check:
	$(PY) tools/gpu_check.py --output output/gpu_check.json
	$(PY) -m pytest -q tests/test_gpu_check.py -k cuda

# CPU quickstarts on generated data (no COCO / ADE20K needed); each ends by drawing its
# training curves (OUTPUT/curves.png); the demo-* targets draw the trained model's predictions.
quickstart-detectron2:
	$(PY) tools/make_synthetic_coco.py --root datasets --train 64 --val 16
	DETECTRON2_DATASETS=datasets $(PY) tools/train_net.py --config detectron2_configs/quickstart/mask_rcnn_srvit_tiny_cpu.py
	$(PY) tools/plot_curves.py output/quickstart_detectron2

quickstart-detectron2-win:
	$(PY) tools/make_synthetic_coco.py --root datasets --train 64 --val 16
	DETECTRON2_DATASETS=datasets $(PY) tools/train_net.py --config detectron2_configs/quickstart/mask_rcnn_srvit_tiny_win_cpu.py
	$(PY) tools/plot_curves.py output/quickstart_detectron2_win

quickstart-mmseg:
	$(PY) tools/make_synthetic_ade20k.py --root datasets --train 32 --val 8
	$(PY) tools/train_seg.py mmseg_configs/quickstart/upernet_srvit_tiny_cpu.py
	$(PY) tools/test_seg.py mmseg_configs/quickstart/upernet_srvit_tiny_cpu.py output/quickstart_mmseg/iter_200.pth --tta
	$(PY) tools/plot_curves.py output/quickstart_mmseg

quickstart-mmdet:
	$(PY) tools/make_synthetic_coco.py --root datasets --train 64 --val 16
	$(PY) tools/train_det.py mmdet_configs/quickstart/mask_rcnn_srvit_tiny_cpu.py
	$(PY) tools/plot_curves.py output/quickstart_mmdet

demo-detectron2:
	$(PY) tools/demo.py detectron2_configs/quickstart/mask_rcnn_srvit_tiny_cpu.py \
		--checkpoint output/quickstart_detectron2/model_final.pth --input datasets/coco/val2017 \
		--output output/quickstart_detectron2/demo --save-raw

demo-mmseg:
	$(PY) tools/demo.py mmseg_configs/quickstart/upernet_srvit_tiny_cpu.py \
		--checkpoint output/quickstart_mmseg/iter_200.pth --input datasets/ade/ADEChallengeData2016/images/validation \
		--output output/quickstart_mmseg/demo --save-raw

demo-mmdet:
	$(PY) tools/demo.py mmdet_configs/quickstart/mask_rcnn_srvit_tiny_cpu.py \
		--checkpoint output/quickstart_mmdet/iter_300.pth --input datasets/coco/val2017 \
		--output output/quickstart_mmdet/demo --save-raw
