from orchestrator.runtime.cli import main

raise SystemExit(main())
