from orchestrator.runtime.cli import entry

raise SystemExit(entry())
