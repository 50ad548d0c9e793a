#!/bin/bash
# Oracle (runs as the agent user, in the workdir).
set -euo pipefail
id -un > ~/whoami.txt
printf '#!/bin/bash\necho "hello from agent"\n' > greet.sh
chmod +x greet.sh
