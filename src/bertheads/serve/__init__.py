"""The HTTP face: `app` (the FastAPI app, request checks, graceful drain), `queue` (the bounded request
queue, deadlines and token budgets), `guard` (Host check, bearer token, body limit, CORS, metrics) and
`page.html`, the web page. Imports the library (`bertheads.api`), never the other way round."""
