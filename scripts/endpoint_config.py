"""Turn a config's local (`source: hf`) models into vLLM endpoint models on this machine's ports.

    python scripts/endpoint_config.py configs/paper-llama2-7b-vs-13b.yaml > runs/llama2-vllm.yaml
    python scripts/endpoint_config.py C.yaml --replicas 8 > C-vllm.yaml   # one server per GPU

Model i's replica r listens on port `base_port + 100 * i + r` (where scripts/score_with_vllm.sh starts it),
is asked for the hub id it was loaded from (`served_model`), plans its windows with the same
tokenizer, and reads vLLM's `prompt_logprobs` (each entry names its token id: the strictest check).
Everything else in the config is kept, so the same file drives the sharded scoring workers,
`bbox merge` and the later stages (the score stage's key covers the models section: a later
`bbox run` with this file finds every shard done and starts no server).
"""

from __future__ import annotations

import argparse
import sys

import yaml

from bbox_sae.config import config_from_dict, load_raw


def endpoint_models(raw: dict, base_port: int, replicas: int, concurrency: int) -> dict:
    out = dict(raw)
    models = []
    for i, m in enumerate(raw["models"]):
        m = dict(m)
        if m.get("source", "hf") == "hf":
            hub_id = m["path"]
            for local_only in ("path", "dtype", "device", "batch_size", "logprob_chunk"):
                m.pop(local_only, None)
            m.update(
                source="endpoint",
                endpoints=[f"http://127.0.0.1:{base_port + 100 * i + r}" for r in range(replicas)],
                served_model=hub_id,
                tokenizer=hub_id,
                prompt_logprobs=True,
                concurrency=concurrency,
            )
        models.append(m)
    out["models"] = models
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument("--base-port", type=int, default=8000)
    p.add_argument("--replicas", type=int, default=1, help="vLLM servers per model (one per GPU)")
    p.add_argument("--concurrency", type=int, default=8, help="in-flight requests per server")
    args = p.parse_args(argv)
    raw = endpoint_models(load_raw(args.config), args.base_port, args.replicas, args.concurrency)
    config_from_dict(raw, source=args.config)  # refuse to write a config the pipeline would reject
    sys.stdout.write(yaml.safe_dump(raw, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
