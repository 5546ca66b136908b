"""Development tools for the notebooks; not part of the package (nothing in rlhf_lab imports them).

notebook_runner.py   execute notebooks in a fresh kernel and keep them renderable on GitHub
prose_check.py       every number a notebook's prose states comes from its committed outputs
"""
