"""The offline minis of the paper's agentic testbeds (§5), environments like any user's would be (env_base.Env):
SearchQA-mini (searchqa.py, numpy BM25 in bm25.py), WebShop-mini (webshop.py, catalogue in webshop_catalogue.py) and
DeepCoder-mini (deepcoder.py, problems in deepcoder_problems.py, model-written code run by sandbox.py behind
bubblewrap). Registered in envs.py under their --env names (searchqa, webshop, deepcoder).
Run: python envs.py searchqa --seed 10000 --show;  python -m agentic.searchqa / -m agentic.webshop (measurements)."""
