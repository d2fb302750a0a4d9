from diode.cli import main

raise SystemExit(main())
