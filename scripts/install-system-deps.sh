#!/usr/bin/env bash
# System packages the test suite needs (run as root by .ci/run; `make run` never needs it).
# Idempotent: packages already present cost one dpkg query.
set -euo pipefail

PACKAGES=(
  # the real Slurm controller and daemons the inventory and executor tests start on localhost
  slurm-wlm slurm-client munge
  # Slurm accounting (sacct) for the cost-of-waiting tests: slurmdbd storing into the machine's MariaDB
  slurmdbd slurm-wlm-mysql-plugin mariadb-client
  # the real browser the UI tests drive through Playwright
  chromium
  # certificates for the TLS test Kubernetes API server (tests/kube/pki.py)
  openssl
  # the fault suite restarts a Redis of its own (tests/faults)
  redis-server
  # a real OCI registry (CNCF distribution) for the kubelet checkpoint path's images (tests/kube/registry.py)
  docker-registry
  # Prometheus and promtool: scrape /metrics during a campaign, check and unit-test the alert rules
  prometheus
  # WeasyPrint's libraries for the auditors' PDF reports, a font, and poppler (pdftoppm, pdftotext)
  # for the tests that turn a report into images and text
  libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz0b libharfbuzz-subset0 fonts-dejavu-core poppler-utils
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
# Node.js and npm for the test OpenID provider (tests/oidc: npm's oidc-provider, which `make test`
# installs with `npm ci`); machines of this project's kind come with Node.js 20 and npm.
command -v npm >/dev/null || missing+=(nodejs npm)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
