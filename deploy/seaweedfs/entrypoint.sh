#!/bin/sh
# Entrypoint of the compose `seaweedfs` service. SeaweedFS reads S3 identities from a JSON
# file and cannot expand environment variables in it, so s3.json is a template with
# @S3_ACCESS_KEY@ / @S3_SECRET_KEY@ placeholders that we fill in here, at start, from the
# container environment. The result lives in /run (container-private, not in the image,
# not on a volume), so the secret is never committed nor persisted.
# POSIX sh: the chrislusf/seaweedfs image is Alpine (busybox), there is no bash.
set -eu

: "${S3_ACCESS_KEY:?S3_ACCESS_KEY must be set}"
: "${S3_SECRET_KEY:?S3_SECRET_KEY must be set}"

# The keys go into JSON and into a sed replacement: allow only characters that need no
# escaping in either, rather than half-escaping and producing a subtly wrong identity.
for key in "$S3_ACCESS_KEY" "$S3_SECRET_KEY"; do
  case "$key" in
    *[!A-Za-z0-9._~+-]*)
      echo "S3 keys may only contain A-Z a-z 0-9 . _ ~ + -" >&2
      exit 64
      ;;
  esac
done

template=/etc/seaweedfs-template/s3.json
config=/run/seaweedfs/s3.json
mkdir -p /run/seaweedfs
umask 077
sed -e "s|@S3_ACCESS_KEY@|${S3_ACCESS_KEY}|g" -e "s|@S3_SECRET_KEY@|${S3_SECRET_KEY}|g" \
  "$template" > "$config"

# exec: weed replaces this shell as PID 1, so it gets the SIGTERM of `docker stop` directly.
exec weed "$@" -s3.config="$config"
