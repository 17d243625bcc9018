"""The HTTP face: `app` (the FastAPI app, request checks, graceful drain), `queue` (the bounded request
queue, deadlines and token budgets), `guard` (Host check, bearer token, body limit, CORS, metrics) and
`page.html`, the web page; `pyfunc`, MLflow's `python_function` flavour (what `mlflow models serve`
and `mlflow.pyfunc.load_model` load). Imports the library (`bertheads.api`), never the other way round."""
