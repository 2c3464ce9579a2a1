from ops.cli.app import app

app()
