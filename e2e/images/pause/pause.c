/* The pod sandbox ("pause") process for the test nodes: holds the pod's namespaces, reaps
 * orphaned children, and exits on SIGINT/SIGTERM. Built static with musl-gcc by e2e/image.sh,
 * because no registry is reachable to pull registry.k8s.io/pause. Same behaviour as upstream's
 * build/pause/linux/pause.c. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { _exit(sig == SIGTERM || sig == SIGINT ? 0 : 1); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction term = {.sa_handler = stop};
  struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    return 1;
  }
  for (;;) {
    pause();
  }
}
