r"""Capture, run and integrate on models nobody here wrote: torchvision's resnet18 and Hugging Face's GPT-2.

Both are built from their own packages with random weights (no download). For each model, in one command:

    PYTHONPATH=. python3 scripts/real_models.py --model gpt2 --top 2 --budget 4 \
        --results scripts/results/real_models_h200.json && cp scripts/results/real_models_h200.json $OUT/

1. writes the model file, WORK/<model>.py (get_model() and get_inputs(), at the sizes below);
2. `mkevolve capture` in eval mode: the regions by share of the model's time, and problem files for the
   top --top regions that can be rebuilt from their init arguments;
3. `mkevolve run` on each problem (builtin agent, --iterations 1, --budget B, --eval);
4. `mkevolve integrate` twice, on the model as constructed (training flag as built) and in eval mode: the
   regions whose best solution is correct on the model's own inputs and faster are put in, and the
   end-to-end speedup against eager and torch.compile is measured beside the Amdahl prediction.

Every step's outcome is written to --results as soon as it is known, under the model's name, so a model
whose command was stopped can be run again and only the missing steps run. Without CUDA nothing is timed:
the times are null and the reports say unknown. --small builds tiny versions (CPU tests).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WORK = ROOT / "outputs" / "real_models"
STEP_TIMEOUT_S = 540.0       # default per step; a 10-minute command wants less (--step-timeout)

# The models, as MODEL.py files: the sizes are those of a typical inference batch on one GPU.
MODEL_FILES = {
    "resnet18": '''"""torchvision's resnet18 with random weights, on a batch of {batch} images of {size}x{size}."""

import torch
import torchvision


def get_model():
    return torchvision.models.resnet18(weights=None)


def get_inputs():
    return [torch.randn({batch}, 3, {size}, {size})]
''',
    "gpt2": '''"""Hugging Face's GPT-2 ({layers} layers, width {width}) from its config, random weights, {batch} x
{tokens} tokens.

Dropout is off so that the model is deterministic in training mode too; the KV cache is off (one forward).
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

CONFIG = dict(n_layer={layers}, n_embd={width}, n_head={heads}, n_positions={tokens}, vocab_size={vocab},
              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)


def get_model():
    return GPT2LMHeadModel(GPT2Config(**CONFIG))


def get_inputs():
    return [torch.randint(0, {vocab}, ({batch}, {tokens}))]
''',
}
SIZES = {
    "resnet18": {"full": dict(batch=16, size=224), "small": dict(batch=2, size=32)},
    "gpt2": {"full": dict(layers=12, width=768, heads=12, batch=4, tokens=512, vocab=50257),
             "small": dict(layers=2, width=32, heads=2, batch=2, tokens=16, vocab=128)},
}


def load_kernelbench():
    """scripts/kernelbench.py, whose process helpers and run-directory reader this script shares."""
    spec = importlib.util.spec_from_file_location("mkevolve_kernelbench_script", ROOT / "scripts" / "kernelbench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


kb = load_kernelbench()


@dataclass
class Settings:
    model: str
    top: int
    budget: int
    small: bool
    work: Path
    results: Path
    step_timeout_s: float = STEP_TIMEOUT_S


def write_model_file(settings: Settings) -> Path:
    sizes = SIZES[settings.model]["small" if settings.small else "full"]
    path = settings.work / f"{settings.model}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(MODEL_FILES[settings.model].format(**sizes), encoding="utf-8")
    return path


# ---- the results file: {model: {"sizes", "capture", "runs", "integrate"}} ----------------------------------


def load_results(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def save_results(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def mkevolve(*args: str) -> list[str]:
    return [sys.executable, "-m", "mkevolve", *args]


# ---- the steps -------------------------------------------------------------------------------------------


def capture_step(model_file: Path, settings: Settings, entry: dict) -> list[Path]:
    """capture.json's top rows in the entry; the problem files written."""
    out = settings.work / "capture"
    step = kb.run_step(mkevolve("capture", str(model_file), "--top", str(settings.top), "--eval",
                                "--out", str(out)),
                       settings.work / "logs" / "capture.log", settings.step_timeout_s, kb.child_env())
    report = out / model_file.stem / "capture" / "capture.json"
    if step.exit_code != 0 or not report.is_file():
        entry["capture"] = {"exit_code": step.exit_code, "error": kb.last_line(step.log)}
        return []
    saved = json.loads(report.read_text(encoding="utf-8"))
    entry["capture"] = {"seconds": round(step.seconds, 1), "device": saved["device"], "timer": saved["timer"],
                        "total_ms": saved["total_ms"],
                        "rows": [{k: r[k] for k in ("path", "type", "ms", "share", "ceiling", "problem", "skipped")}
                                 for r in saved["rows"] if r["problem"] or r["skipped"]]}
    return [Path(r["problem"]) for r in saved["rows"] if r["problem"]]


def run_step(problem: Path, settings: Settings) -> dict:
    """One `mkevolve run` on a captured problem, read back with kernelbench.py's reader."""
    runs = settings.work / "runs"
    step = kb.run_step(mkevolve("run", str(problem), "--model", "builtin", "--iterations", "1",
                                "--budget", str(settings.budget), "--eval", "--out", str(runs)),
                       settings.work / "logs" / f"run_{problem.stem}.log", settings.step_timeout_s, kb.child_env())
    run_dir = kb.find_run_dir(step.log, runs / problem.stem)
    row = {"problem": problem.name, "exit_code": step.exit_code, "seconds": round(step.seconds, 1),
           "run_dir": str(run_dir) if run_dir else None, "last_line": kb.last_line(step.log)}
    if run_dir is not None:
        info = kb.read_run(run_dir)
        row.update(correct=info.correct, speedup_vs_compile=info.run_speedup, all_triton=info.all_triton,
                   llm_calls=info.llm_calls)
    return row


def integrate_step(model_file: Path, run_dirs: list[str], eval_mode: bool, settings: Settings) -> dict:
    name = "eval" if eval_mode else "as_constructed"
    report = settings.work / f"integrate_{name}.json"
    flags = ["--eval"] if eval_mode else []
    step = kb.run_step(mkevolve("integrate", str(model_file), *run_dirs, "-o", str(report), *flags),
                       settings.work / "logs" / f"integrate_{name}.log", settings.step_timeout_s, kb.child_env())
    if step.exit_code != 0 or not report.is_file():
        return {"exit_code": step.exit_code, "error": kb.last_line(step.log)}
    data = json.loads(report.read_text(encoding="utf-8"))
    e2e = data["end_to_end"]
    measured, predicted = e2e.get("speedup_vs_eager"), e2e.get("amdahl")
    data["measured_vs_amdahl"] = (measured / predicted) if measured and predicted else None
    return data


def run_model(settings: Settings, results: dict, environment: dict) -> dict:
    entry = results.setdefault(settings.model, {})
    entry.update(environment=environment, sizes=SIZES[settings.model]["small" if settings.small else "full"],
                 top=settings.top, budget=settings.budget)
    model_file = write_model_file(settings)
    save = lambda: save_results(settings.results, results)  # noqa: E731
    problems = [Path(p) for p in entry.get("problems", [])] or capture_step(model_file, settings, entry)
    entry["problems"] = [str(p) for p in problems]
    save()
    runs = entry.setdefault("runs", {})
    for problem in problems:
        if problem.name not in runs:
            runs[problem.name] = run_step(problem, settings)
            save()
            print(f"{settings.model}: {problem.name}: {runs[problem.name]['last_line']}", flush=True)
    run_dirs = [r["run_dir"] for r in runs.values() if r.get("run_dir")]
    integrate = entry.setdefault("integrate", {})
    for eval_mode, name in ((False, "as_constructed"), (True, "eval")):
        if run_dirs and name not in integrate:
            integrate[name] = integrate_step(model_file, run_dirs, eval_mode, settings)
            save()
            print(f"{settings.model}: integrate ({name}): {summary(integrate[name])}", flush=True)
    return entry


def summary(report: dict) -> str:
    if "end_to_end" not in report:
        return f"failed: {report.get('error')}"
    e2e = report["end_to_end"]
    used = sum(1 for r in report["regions"] if r["verdict"] == "used")
    x = lambda v: "unknown" if v is None else f"{v:.3f}x"  # noqa: E731
    return (f"{used} of {len(report['regions'])} regions used; {x(e2e['speedup_vs_eager'])} vs eager, "
            f"{x(e2e['speedup_vs_compile'])} vs torch.compile, Amdahl {x(e2e['amdahl'])}; "
            f"max abs error {e2e['max_abs_error']}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODEL_FILES), required=True)
    parser.add_argument("--top", type=int, default=2, help="regions to capture and run")
    parser.add_argument("--budget", type=int, default=4, help="LLM calls per subproblem in each run")
    parser.add_argument("--small", action="store_true", help="tiny sizes, for a CPU")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--step-timeout", type=float, default=STEP_TIMEOUT_S, help="seconds per step")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings(model=args.model, top=args.top, budget=args.budget, small=args.small,
                        work=args.work.resolve() / args.model, results=args.results,
                        step_timeout_s=args.step_timeout)
    results = load_results(settings.results)
    entry = run_model(settings, results, kb.environment())
    done = entry.get("integrate", {})
    return 0 if done and all("end_to_end" in report for report in done.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
