-- One outbox shape for every service (shared/outbox): the placer's rows
-- carry the trace that wrote them, as the hub's do.
ALTER TABLE placer_outbox ADD COLUMN traceparent text;
