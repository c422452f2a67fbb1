#!/usr/bin/env bash
# Makes a throwaway CA and certificates for trying dtrain's TLS (tests and local clusters; for
# production use your organization's CA):
#   deploy/tls/make-test-certs.sh DIR [HOST_OR_IP ...]
# Writes DIR/ca.pem (+ ca.key), DIR/server.pem + server.key (valid for localhost, 127.0.0.1,
# this machine's name and every HOST_OR_IP given; used by the coordinator and the workers) and
# DIR/client.pem + client.key (for mutual TLS: the CLI, or any client). Keys are 0600.
set -euo pipefail
dir=${1:?usage: deploy/tls/make-test-certs.sh DIR [HOST_OR_IP ...]}
shift
mkdir -p "$dir"
cd "$dir"
umask 077
days=30

san="DNS:localhost,IP:127.0.0.1,DNS:$(hostname)"
for h in "$@"; do
  if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then san+=",IP:$h"; else san+=",DNS:$h"; fi
done

openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days "$days" \
  -subj "/CN=dtrain test CA" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

issue() {  # name common-name extensions
  openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$1.pem" \
    -days "$days" -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
issue server "dtrain server" "subjectAltName=$san
extendedKeyUsage=serverAuth,clientAuth"
issue client "dtrain client" "extendedKeyUsage=clientAuth"
chmod 644 ca.pem server.pem client.pem
echo "made $dir/{ca,server,client}.pem and keys (server valid for $san)"
