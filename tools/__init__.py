"""Development tools for the notebooks; not part of the package (nothing in rlhf_lab imports them).

notebook_runner.py   execute notebooks in a fresh kernel and keep them renderable on GitHub
prose_check.py       every number a notebook's prose states comes from its committed outputs, and the first
                     cell's full-mode run time is the one the last cell prints
reading_report.py    words of the core path and the deeper sections, interview boxes, sentence length and
                     reading time per notebook (--check: the limits of a course a learner finishes)
"""
