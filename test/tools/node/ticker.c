/* A pod that writes a line a second, for the harness's clusters: the hub's
 * Argo CD shows a pod's logs (`argocd app logs`, the UI's LOGS tab) through
 * argocd-pull's live views, and needs a pod with something to show. No
 * registry serves busybox here; build.sh links this statically, and
 * deploy/images/build.sh makes it image argocd-pull-ticker. Exits on
 * SIGINT or SIGTERM. The line is its first argument (default "tick"),
 * followed by a counter. A second argument writes that many lines at
 * once first (a chatty pod, for the log benchmark), then one a second. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile sig_atomic_t stopping = 0;
static void stop(int sig) { (void)sig; stopping = 1; }

int main(int argc, char **argv) {
  const char *say = argc > 1 ? argv[1] : "tick";
  unsigned long burst = argc > 2 ? strtoul(argv[2], NULL, 10) : 0;
  struct sigaction a = {0};
  a.sa_handler = stop;
  sigaction(SIGINT, &a, NULL);
  sigaction(SIGTERM, &a, NULL);
  for (unsigned long n = 1; !stopping; n++) {
    printf("%s %lu\n", say, n);
    if (n >= burst) {
      fflush(stdout);
      sleep(1);
    }
  }
  return 0;
}
