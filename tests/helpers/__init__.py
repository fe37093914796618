"""What the tests share: the tiny project (`project`), the tiny random-weight models (`assets`),
the CLI as a user sees it (`cli`), fake servers (`fake_openai`, `fake_vllm` on `loopback_server`),
planted answers (`planted`), the kill-and-rerun machinery (`hardening`, `killpoint`) and the
repository's scripts (`repo`).

Imported as `helpers.<module>`: pytest puts tests/ on the import path for its conftest.
"""
