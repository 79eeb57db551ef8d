"""A regular (non-editable) install ships the configs and finds them through the package."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_wheel_install_finds_shipped_configs(tmp_path):
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "wheel"), ROOT],
                   check=True, cwd=str(tmp_path))
    wheel = next((tmp_path / "wheel").glob("srvit_backbones-*.whl"))
    subprocess.run(pip + ["install", "--no-deps", "-q", "--target", str(tmp_path / "site"), str(wheel)], check=True)
    code = ("import srvit_backbones as s; print(s.__file__); "
            "print(s.config_path('detectron2', 'mask_rcnn_srvit_s_t3.py')); "
            "print(s.config_path('mmseg', 'upernet_srvit_s.py')); print(len(s.list_configs('mmseg')))")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                         check=True).stdout.split()
    site = str(tmp_path / "site")
    assert out[0].startswith(site)  # the installed copy, not the source tree
    assert out[1] == os.path.join(site, "srvit_backbones", "_configs", "detectron2_configs", "mask_rcnn_srvit_s_t3.py")
    assert out[2].startswith(site) and os.path.isfile(out[2]) and int(out[3]) >= 8
    assert os.path.isfile(os.path.join(site, "srvit_backbones", "_configs", "mmseg_configs", "_base_",
                                       "upernet_srvit_mln_160k_ade20k.py"))
