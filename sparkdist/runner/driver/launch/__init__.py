"""How a job's world is formed and launched: one interface (`api.LaunchKind`, in `api`), one kind
per way (`local`, `barrier`, `relayed`, `gang_kind` with its `gang`), chosen by
`job.choose_kind`. `job.run_job` drives any of them through the same loop."""
