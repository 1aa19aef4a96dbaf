-- read_layout: the dedup layout's one row.
SELECT daily_from, daily_ready, keep_days, ahead_days, dropped_before FROM {{layout}}
