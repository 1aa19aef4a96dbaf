{{/* position_columns: what dedup.Position is read from. */}}
{{- define "position_columns" -}}
kafka_partition, next_offset, incarnation, anchor_time, coalesce(anchor_offset, next_offset - 1), epoch, updated_at
{{- end}}
