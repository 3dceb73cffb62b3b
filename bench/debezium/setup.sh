#!/usr/bin/env bash
# Fetch the Debezium jars pinned in pom.xml into bench/debezium/lib (Maven's local repository
# caches them) and compile Runner.java into bench/debezium/classes. Run by
# bench/bench_vs_debezium.py when either is missing; CI runs no benchmark, so .ci/setup does not
# call it. Needs mvn and a JDK (javac): `apt-get install maven default-jdk-headless`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
if [ ! -f lib/.complete ]; then
    rm -rf lib
    mvn -q -B dependency:copy-dependencies -DoutputDirectory=lib -DincludeScope=runtime
    touch lib/.complete
fi
rm -rf classes
mkdir -p classes
javac -cp 'lib/*' -d classes Runner.java
