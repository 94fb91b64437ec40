from gpu_k8s_update.cli import main

raise SystemExit(main())
