"""One module per ``parsearch`` sub-command, each with ``register(subparsers)`` (adds its
parser, sets ``func``). Their names and one-line helps are listed here, so that the command
line can show them all while importing only the module of the command that runs."""

COMMANDS: dict[str, str] = {
    "plan": "count and rank the layouts of a space by the analytic estimate",
    "probe": "measure the allocation (GEMMs, collectives, memory) into a machine profile",
    "run": "search a space: run trials chosen by Bayesian optimisation, record them",
    "resume": "continue a campaign after a kill, a signal or the end of an allocation",
    "status": "progress of a campaign: trials by state, best so far, ETA",
    "best": "the best layout of a campaign so far",
    "top": "the k best layouts of a campaign so far",
    "show": "one trial whole: layout, state and why, metrics, prediction, command, log tail",
    "trial": "dry run: one layout on this machine; prints the command, metrics, state, log",
    "scaling": "run the best layout at several allocation sizes: weak/strong scaling efficiency",
    "export": "write a campaign's trials to CSV or Parquet, or log them to MLflow",
    "report": "write PNG figures and an HTML page (index.html) for a campaign",
    "serve": "a live dashboard and JSON API over a store (read-only)",
    "store": "work on a whole store: copy it between SQLite and PostgreSQL (store copy)",
}
