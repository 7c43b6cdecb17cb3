"""The labs on a real vLLM (``engine=vllm`` on ``host``/``gpu``): one runner per lab returns raw
rows; :mod:`.report` turns them into the lab record and Markdown, with the seed's expectation
beside what the real engine did. ``python -m workbench.labs.vllm_runs LAB --backend B``."""
