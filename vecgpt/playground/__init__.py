"""`vecgpt serve`: the playground (generate, click a token, branch, step back) and the streaming-attention page.

`server.Library` holds what the server opened: one store per config, one engine per model, the texts;
`routes` turns HTTP requests into its calls; `app` builds the Starlette app and runs it on uvicorn.
Every page and script ships in `static/` (no network).
"""
