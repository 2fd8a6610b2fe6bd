#!/bin/sh
# The postgres image runs this once, on an empty data directory
# (/docker-entrypoint-initdb.d): the per-service login users of
# compose/postgres-roles.sql, with passwords from the environment.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v hub_password="${FLEET_DB_HUB_PASSWORD:-dev-hub}" \
  -v api_password="${FLEET_DB_API_PASSWORD:-dev-api}" \
  -v placer_password="${FLEET_DB_PLACER_PASSWORD:-dev-placer}" \
  -v gateway_password="${FLEET_DB_GATEWAY_PASSWORD:-dev-gateway}" \
  -v radar_password="${FLEET_DB_RADAR_PASSWORD:-dev-radar}" \
  -v workflow_password="${FLEET_DB_WORKFLOW_PASSWORD:-dev-workflow}" \
  -f /fleet/postgres-roles.sql
