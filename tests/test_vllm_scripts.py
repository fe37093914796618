"""scripts/score_with_vllm.sh: each model's replicas are up on their own port and GPU while
`bbox score` runs for that model (with the worker's shard), and are stopped afterwards.

Fake `vllm` and `bbox` executables stand in for the real ones: the fake server answers /health
and records how it was started; the fake bbox records its arguments and which servers answered.
"""

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import yaml

from helpers.repo import REPO, load_script

FAKE_VLLM = """\
import http.server, json, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
with open(os.environ["RECORD"], "a") as fh:
    fh.write(json.dumps({"model": sys.argv[2], "port": port, "gpu": os.environ["CUDA_VISIBLE_DEVICES"]}) + "\\n")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _free_base() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1] % 20000 + 30000


def _up(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200
    except OSError:
        return False


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_each_model_is_served_on_its_gpus_while_it_is_scored(tmp_path):
    base = _free_base()
    raw = {
        "output_dir": str(tmp_path / "out"),
        "corpus": {"path": str(tmp_path / "c.jsonl")},
        "models": [{"name": "a", "path": "org/model-a", "window": 64, "stride": 32}, {"name": "b", "path": "org/model-b", "window": 64, "stride": 32}],
    }
    cfg = tmp_path / "vllm.yaml"
    cfg.write_text(yaml.safe_dump(load_script("scripts/endpoint_config.py").endpoint_models(raw, base_port=base, replicas=2, concurrency=4)))
    ports = {"a": [base, base + 1], "b": [base + 100, base + 101]}
    vllm = _executable(tmp_path / "vllm", f"#!{sys.executable}\n" + FAKE_VLLM)
    bbox = _executable(
        tmp_path / "bbox",
        textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys, urllib.request
        up = {{}}
        for name, ps in {ports!r}.items():
            for p in ps:
                try:
                    up[p] = urllib.request.urlopen(f"http://127.0.0.1:{{p}}/health", timeout=2).status == 200
                except OSError:
                    up[p] = False
        with open({str(tmp_path / "calls.jsonl")!r}, "a") as fh:
            fh.write(json.dumps({{"argv": sys.argv[1:], "up": up}}) + "\\n")
        """),
    )
    env = {
        **os.environ,
        "VLLM": str(vllm),
        "BBOX": str(bbox),
        "PY": sys.executable,
        "RECORD": str(tmp_path / "servers.jsonl"),
        "CUDA_VISIBLE_DEVICES": "5,7",
        "LOGS": str(tmp_path / "logs"),
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "score_with_vllm.sh"), str(cfg), "--shard", "1/3"], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr

    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [c["argv"] for c in calls] == [["score", "-c", str(cfg), "--model", m, "--shard", "1/3"] for m in ("a", "b")]
    for call, name, other in zip(calls, "ab", "ba"):
        # The scored model's replicas answer; the other model's are not running (one model at a time).
        assert all(call["up"][str(p)] for p in ports[name]) and not any(call["up"][str(p)] for p in ports[other])
    servers = [json.loads(line) for line in (tmp_path / "servers.jsonl").read_text().splitlines()]
    assert sorted((s["model"], s["port"], s["gpu"]) for s in servers) == [
        ("org/model-a", base, "5"),
        ("org/model-a", base + 1, "7"),
        ("org/model-b", base + 100, "5"),
        ("org/model-b", base + 101, "7"),
    ]
    assert not any(_up(p) for ps in ports.values() for p in ps)


def test_more_replicas_than_gpus_is_refused_before_any_server_starts(tmp_path):
    raw = {"output_dir": "o", "corpus": {"path": "c"}, "models": [{"name": "a", "path": "x/a"}, {"name": "b", "path": "x/b"}]}
    cfg = tmp_path / "vllm.yaml"
    cfg.write_text(yaml.safe_dump(load_script("scripts/endpoint_config.py").endpoint_models(raw, base_port=_free_base(), replicas=2, concurrency=4)))
    env = {
        **os.environ,
        "VLLM": "/bin/false",
        "BBOX": "/bin/false",
        "PY": sys.executable,
        "CUDA_VISIBLE_DEVICES": "0",
        "LOGS": str(tmp_path / "logs"),
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.run(["bash", str(REPO / "scripts" / "score_with_vllm.sh"), str(cfg)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "2 replicas but only 1 GPU(s)" in proc.stderr
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())
