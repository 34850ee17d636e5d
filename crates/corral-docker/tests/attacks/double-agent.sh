# A test double of the agent (busybox sh, run as PID 1 of a plain
# container): it completes the handshake like the real agent, then answers
# the first Exec with the misbehaviour named by $1, to check that corral
# treats it as a protocol violation and never as a result. Needs the
# `frame` helpers of forge-frames.sh.
#   unknown-id     output and Exited for a command corral never started
#   exit-first     Exited without Started
#   after-exit     Started, Exited, then more output
# corral's sync bytes (16), then the Hello frame: a 9-byte header (kind,
# id, length) and its payload, read by its length.
dd bs=1 count=16 >/dev/null 2>&1
scenario=$1
set -- "$scenario" $(dd bs=1 count=9 2>/dev/null | od -An -tu1)
hlen=$(( ($7<<24) + ($8<<16) + ($9<<8) + ${10} ))
hello=$(dd bs=1 count="$hlen" 2>/dev/null | tr -cd '0-9a-z":{},')
set -- "$scenario"
session=$(echo "$hello" | sed -n 's/.*"session":"\([0-9a-f]*\)".*/\1/p')
printf '\000corral-sync\245\132\303\074'
frame 64 0 "{\"protocol\":2,\"agent_version\":\"double\",\"oom_counter\":\"none\",\"session\":\"$session\"}"
set -- "$1" $(dd bs=1 count=9 2>/dev/null | od -An -tu1)
id=$(( ($3<<24) + ($4<<16) + ($5<<8) + $6 ))
len=$(( ($7<<24) + ($8<<16) + ($9<<8) + ${10} ))
dd bs=1 count="$len" >/dev/null 2>&1
ok='{"exit_code":0,"signal":null,"timed_out":false,"oom_killed":false,"duration_us":1,"stdout":{"total_bytes":17,"truncated":false},"stderr":{"total_bytes":0,"truncated":false}}'
case "$1" in
  unknown-id) frame 66 $((id + 100)) 'all tests passed
'; frame 70 $((id + 100)) "$ok";;
  exit-first) frame 70 "$id" "$ok";;
  after-exit) frame 65 "$id" '{"pid":2}'; frame 70 "$id" "$ok"; frame 66 "$id" 'all tests passed
';;
esac
sleep 600
