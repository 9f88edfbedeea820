"""redsaga inside the services people run: web frameworks' lifespans and error responses.

:mod:`saga.integrations.starlette` runs a :class:`~saga.SagaWorker` for as long as a
Starlette or FastAPI app runs, and answers redsaga's errors with HTTP statuses
(:data:`~saga.integrations.http.STATUSES`, usable by any framework). docs/embedding.md
has the recipes (FastAPI, Django) and when to run the worker as its own process instead.
"""
