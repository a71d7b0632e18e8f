/* The sandbox ("pause") container of the harness's nodes: holds a pod's
 * namespaces, reaps orphans, exits on SIGINT or SIGTERM. What Kubernetes'
 * own pause image does (build/pause/linux/pause.c), written here because
 * no registry is reachable; build.sh links it statically. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
  struct sigaction a = {0};
  a.sa_handler = stop;
  sigaction(SIGINT, &a, NULL);
  sigaction(SIGTERM, &a, NULL);
  a.sa_handler = reap;
  a.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &a, NULL);
  for (;;) pause();
  return 1;
}
