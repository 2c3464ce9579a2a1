from ops.cli import app

app()
