from autoscalerd.cli import main

raise SystemExit(main())
