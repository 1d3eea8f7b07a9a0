# Untested here (no Docker engine on the development machines); see README.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 GPUSWEEP_VAR_DIR=/var/lib/gpusweep
WORKDIR /app
COPY requirements.txt requirements.lock ./
COPY agent/ agent/
RUN pip install --no-cache-dir -r requirements.txt -c requirements.lock && pip install --no-cache-dir ./agent
COPY . .
RUN useradd --system --uid 10001 --home /app gpusweep && mkdir -p /var/lib/gpusweep && chown gpusweep /var/lib/gpusweep
USER gpusweep
EXPOSE 8000
CMD ["gunicorn", "gpusweep.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3"]
