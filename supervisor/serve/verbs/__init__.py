"""One module per verb of the daemon's API; each has ``async def handle(d, req, ...)``."""
