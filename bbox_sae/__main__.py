from bbox_sae.cli import main

raise SystemExit(main())
