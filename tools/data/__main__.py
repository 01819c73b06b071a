from tools.data.cli import main

raise SystemExit(main())
