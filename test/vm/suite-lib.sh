# Sourced by the guest suites (test/vm/run-tests, test/vm2/run-tests; and
# server_client by test/regcache/vm-suite): how a guest suite runs a test
# and a server with its client.

# (sourcing it again keeps the counts)
: "${suite_pass:=0}" "${suite_fail:=0}" "${suite_skip:=0}"
# a misspelt call in the suite script itself is a failure, not a silent gap
trap 'if [ $? = 127 ]; then suite_fail=$((suite_fail + 1))
      echo "FAIL suite script: a command was not found (bash says which)"; fi' ERR

# suite_run NAME FUNCTION [ARGS...]: runs FUNCTION with its output in
# $suite_outdir/NAME.txt; status 0 pass, 77 skip (the reason: its last
# "skip:" line), anything else fail. Prints one PASS/SKIP/FAIL line (with
# the tail of the output on failure) and the output's lines that match
# $suite_show (an extended regex; "result: " is stripped). Runs only the
# tests named in $suite_only (" A B ", or "  " for all). With KREG_VM_PASS
# set, NAME gets "@$KREG_VM_PASS".
suite_run() {
    local name=$1 t0=$SECONDS rc
    shift
    [ "${suite_only:-  }" = "  " ] || [[ $suite_only == *" $name "* ]] || return 0
    name=$name${KREG_VM_PASS:+@$KREG_VM_PASS}
    "$@" >"$suite_outdir/$name.txt" 2>&1
    rc=$?
    case $rc in
        0)  suite_pass=$((suite_pass + 1))
            echo "PASS $name ($((SECONDS - t0)) s)" ;;
        77) suite_skip=$((suite_skip + 1))
            echo "SKIP $name: $(grep -h 'skip:' "$suite_outdir/$name.txt" | tail -1 | sed 's/.*skip: *//')" ;;
        *)  suite_fail=$((suite_fail + 1))
            echo "FAIL $name (status $rc after $((SECONDS - t0)) s)"
            # what a crash's backtrace hides: the test that ran, and the
            # warnings before it (a log's tail is all CI shows of a guest)
            grep -E '^\[ RUN|WARN|ERROR|held for' "$suite_outdir/$name.txt" |
                tail -n 8 | sed 's/^/    : /'
            tail -n 40 "$suite_outdir/$name.txt" | sed 's/^/    | /' ;;
    esac
    grep -hE "${suite_show:-^result: }" "$suite_outdir/$name.txt" |
        sed 's/^result: //; s/^/    /'
}

# suite_result [LABEL]: the closing "LABEL-RESULT: N passed, N failed, N
# skipped" line (LABEL: KREG); status 1 if a test failed.
suite_result() {
    echo "${1:-KREG}-RESULT: $suite_pass passed, $suite_fail failed, $suite_skip skipped"
    [ $suite_fail = 0 ]
}

# server_client OUT SECONDS SERVER CLIENT [PREFIX...]: SERVER (a shell
# command line) in the background, through PREFIX when given (e.g. on_peer:
# on the other guest); CLIENT here, retried while the server does not listen
# yet. Each gets SECONDS. Outputs: OUT.server and OUT.client; what ran and
# both outputs are printed. Status 0 when both succeeded.
server_client() {
    local out=$1 tmo=$2 server=$3 client=$4 spid crc src try
    shift 4
    "$@" timeout -k 5 "$tmo" bash -c "$server" >"$out.server" 2>&1 &
    spid=$!
    for try in $(seq 1 20); do
        sleep $((try < 5 ? 1 : 2))
        timeout -k 5 "$tmo" bash -c "$client" >"$out.client" 2>&1
        crc=$?
        grep -qiE "couldn't connect|connection refused|failed to connect|connection timed out" \
            "$out.client" || break
        kill -0 $spid 2>/dev/null || break
    done
    wait $spid
    src=$?
    echo "--- server (status $src): $server"
    cat "$out.server"
    echo "--- client (status $crc, try $try): $client"
    cat "$out.client"
    [ $src = 0 ] && [ $crc = 0 ]
}
