"""Engine adapters: patch vLLM / SGLang at import time so their KV memory comes from the workbench.

Off unless ``WORKBENCH_KV_AUTOPATCH=1``. A ``.pth`` file (``python -m workbench.adapters.pth
install``) runs :func:`workbench.adapters.boot.install` at interpreter start, which puts an import
hook on ``sys.meta_path``; each engine's patch plan applies all-or-nothing once its target modules
have loaded. See ``registry.py`` for the rules and ``docs/adapters.md`` for the patch list.
"""
