"""Chat with the model from the command line: `python -m engine "What is the capital of France?"`."""

from __future__ import annotations

import argparse
import sys

from engine.config import EngineConfig
from engine.llm import LLM
from engine.messages import RequestOutput
from engine.sampling_params import SamplingParams


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    parser.add_argument("prompt", nargs="*", help="the question; without one, read questions line by line")
    parser.add_argument("--model", default="default")
    parser.add_argument("--quantization", default="nf4", choices=["none", "nf4", "fp4", "int8"])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)
    llm = LLM(
        EngineConfig(model=args.model, quantization=args.quantization),
        progress=lambda what: print(f"[{what}]", file=sys.stderr),
    )
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    questions = [" ".join(args.prompt)] if args.prompt else (line.strip() for line in sys.stdin)

    def stream(outputs: list[RequestOutput]) -> None:
        for out in outputs:
            print(out.text, end="", flush=True)

    for question in questions:
        if question:
            llm.generate([llm.chat_prompt([{"role": "user", "content": question}])], params, on_step=stream)
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
