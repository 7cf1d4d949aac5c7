"""What the reasoning became: per run, how many logged `<think>` texts are the prompt's placeholder, how many distinct.

The MI proxy says *whether* the reasoning still depends on the input; this says *what it collapsed to*, read off
the samples a run logs (`samples.jsonl`, `--log-samples` per step). Over the logged first-turn responses of the
chosen steps it counts
- placeholder: the `<think>` text starts with the instructions' bracketed placeholder (`[Your thoughts]`,
  `[your reasoning]`, ...), i.e. the model copies the format line instead of reasoning (low-entropy collapse:
  one fixed text whatever the input);
- distinct: how many different `<think>` texts there are (1 = one template for every input);
- no think: responses without a closed `<think>...</think>` (cut off, or no format);
- most common: the most frequent text and its count.
The paper's *template* collapse (diverse reasoning that ignores the input) is what the MI proxy measures; this
table tells it apart from the plainer low-entropy collapse seen in experiments/PROTOCOL.md.

Leaves out: later turns of multi-turn episodes (the first assistant message only), any judgement of what the
text says.

Run: python experiments/reasoning_texts.py experiments/protocol/protocol-*-s* --steps 16:24
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))       # the project's modules live at the root
from runlog import read_jsonl  # noqa: E402

THINK = re.compile(r"<think>(.*?)</think>", re.S)
PLACEHOLDER = re.compile(r"\[\s*your\b", re.I)      # "[Your thoughts]", "[your reasoning] ...", "[ Your answer ]"


def think_text(response: str) -> str | None:
    """The stripped text inside the first `<think>...</think>` of `response`, None where there is none."""
    m = THINK.search(response)
    return m.group(1).strip() if m else None


def first_response(sample: dict) -> str:
    """The first assistant message of a logged sample (samples.jsonl row)."""
    return next(m["content"] for m in sample["messages"] if m["role"] == "assistant")


def summarise(samples: list[dict], lo: int, hi: int) -> dict:
    """Counts over the samples with lo <= step < hi (see the module docstring)."""
    texts = [think_text(first_response(s)) for s in samples if lo <= s["step"] < hi]
    found = [t for t in texts if t is not None]
    common, count = collections.Counter(found).most_common(1)[0] if found else ("", 0)
    return {"samples": len(texts), "placeholder": sum(bool(PLACEHOLDER.match(t)) for t in found),
            "distinct": len(set(found)), "no_think": len(texts) - len(found), "most_common": common,
            "most_common_count": count}


def parse_steps(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    if not sep or not lo.strip().lstrip("-").isdigit() or not hi.strip().isdigit() or int(lo) >= int(hi):
        raise argparse.ArgumentTypeError(f"--steps: expected LO:HI with LO < HI (steps LO..HI-1), got {text!r}")
    return int(lo), int(hi)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run directories (each with samples.jsonl)")
    ap.add_argument("--steps", type=parse_steps, default=(0, 10 ** 9), help="LO:HI, the steps LO..HI-1 (default all)")
    a = ap.parse_args(argv)
    missing = [r for r in a.runs if not (Path(r) / "samples.jsonl").is_file()]
    if missing:
        ap.error(f"no samples.jsonl in {', '.join(missing)}")
    lo, hi = a.steps
    print(f"| run | samples (steps {lo}-{hi - 1}) | placeholder | distinct | no think | most common |")
    print("|---|---|---|---|---|---|")
    out = []
    for r in a.runs:
        s = {"run": Path(r).name, **summarise(read_jsonl(Path(r) / "samples.jsonl"), lo, hi)}
        text = s["most_common"].replace("|", "\\|").replace("\n", " ")
        print(f"| {s['run']} | {s['samples']} | {s['placeholder']} | {s['distinct']} | {s['no_think']} | "
              f"{text[:50]}{'...' if len(text) > 50 else ''} ({s['most_common_count']}) |")
        out.append(s)
    return out


if __name__ == "__main__":
    main()
