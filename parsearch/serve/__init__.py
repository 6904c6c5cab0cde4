"""``parsearch serve``: a read-only JSON API and a live dashboard over a campaign store.

:mod:`.views` and :mod:`.figures` compute the answers (plain data, no web framework);
:mod:`.app` is the FastAPI application; ``static/`` holds the page and its script, so the
dashboard needs no CDN. FastAPI and uvicorn come with the ``serve`` extra and are imported
only by :mod:`.app` and the command.
"""
