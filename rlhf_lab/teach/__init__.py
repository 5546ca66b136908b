"""Teaching material around the notebooks.

notebook.py   what every notebook imports first: the FAST switch, seeding, Stop and re-run behaviour
drill.py      the interview question bank, the glossary and the mock interview (notebook 13)
mistakes.py   common PPO/GRPO implementation mistakes, each runnable beside the correct code
"""
