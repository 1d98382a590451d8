"""`jobs/bench.py gpu --dry-run`: the GPU benchmark's code at tiny shapes on CPU, as on the GPU image:
Ray, DeepSpeed and MLflow absent (None in sys.modules: `import` fails and `find_spec` says absent, which
is what transformers' own probes see there)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCK = 'import sys\nfor m in ("ray", "deepspeed", "mlflow"):\n    sys.modules[m] = None\n'

RUNNER = BLOCK + """
import runpy
sys.argv = ["jobs/bench.py", "gpu", "--dry-run", "--new-tokens", "6", "--out", sys.argv[1]]
runpy.run_path("jobs/bench.py", run_name="__main__")
"""

# Modules `jobs/bench.py gpu` imports only on a GPU, or only in some sections: each must import without them.
GPU_MODULES = ["lilicorr.bench.gpu_train", "lilicorr.bench.gpu_decode",
               "lilicorr.bench.hf_peer", "lilicorr.bench.sections", "lilicorr.engine.cuda_graphs",
               "lilicorr.bench.kernels", "lilicorr.kernels.topk_logsoftmax_triton", "lilicorr.kernels.lattice_triton",
               "lilicorr.models.joint", "lilicorr.bench.gpu_serve_load", "lilicorr.serve_apps.loading",
               "lilicorr.serve_apps.app", "lilicorr.engine.threaded"]
SECTIONS = ["bandwidth", "graphs", "ar", "verify", "agreement", "kernels", "head", "engine", "hf_eager", "serve_load",
            "train_none", "train_lilicorr", "train_domino", "train_dspark", "hf_static"]


def _env():
    return dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")


def test_gpu_bench_modules_import_without_ray_deepspeed_mlflow():
    code = BLOCK + "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in GPU_MODULES)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_block_is_real():  # the check above would pass vacuously if None in sys.modules did not block
    proc = subprocess.run([sys.executable, "-c", BLOCK + "import deepspeed"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "deepspeed" in proc.stderr


def test_gpu_bench_dry_run_prints_every_figure_without_platform_services(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(out)], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["dry_run"] and res["failed_sections"] == []
    assert list(res["section_s"]) == SECTIONS  # every section ran, in order, each with its wall time
    for key in ("ar_tok_s", "verify16_over_ar_step", "head_ms_per_block", "greedy_agreement_vs_eager",
                "greedy_agreement_vs_hf", "engine_ar_tok_s", "hf_eager_tok_s", "speedup_over_hf_eager",
                "hf_static_tok_s", "speedup_over_hf_static", "hf_static_recompiles_in_timed_call"):
        assert key in res, key
    # teacher-forced on one sequence: fp32-accumulating SDPA vs the eager order, tiny bf16 model on CPU
    assert res["greedy_agreement_vs_eager"] == 1.0 and res["agreement_positions"] == 6
    assert res["kernels"].startswith("n/a on CPU") and res["cuda_graphs"].startswith("n/a on CPU")
    assert res["engine_cuda_graph_captured"] is None and res["engine_eager_retry_blocks"] == 0
    assert res["hf_static_new_tokens"] == res["hf_eager_new_tokens"] == 6
    assert res["target_dtype"] == "torch.bfloat16" and res["drafter_dtypes"] == ["torch.bfloat16"]
    for head in ("none", "lilicorr", "domino", "dspark"):
        assert res[f"train_{head}_step_s"] > 0 and res[f"train_{head}_params_m"] > 0, head
        assert res[f"train_{head}_param_dtype"] == "torch.float32"  # the dry run trains in fp32 on CPU
    assert res["train_shape"]["block"] == 16 and res["train_shape"]["top_k"] == 8
    assert res["serve_on_expected_device"] is True
    assert res["serve_weights_device"]["tiny-random-dflash"] == {"target": ["cpu"], "drafter": ["cpu"]}
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == res  # the JSON line on stdout is the file's
