from runfleet.ops.cli.app import app

app()
