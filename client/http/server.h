/*
 * client/http/server.h — the HTTP side of kvd-http (server.c).
 */
#ifndef KVD_HTTP_SERVER_H
#define KVD_HTTP_SERVER_H

#include "http.h"

#include <stdio.h>

struct http_server;

/* The routes kvd-http serves, one per line (method, path, what it does),
 * for --help. */
void http_routes_help(FILE *f);

/*
 * Start serving on listen_fd (a bound, listening TCP socket the server
 * then owns). Reads the API key file when one is configured. Returns 0 and
 * the server, -errno when the key file cannot be read (-EINVAL: empty or
 * longer than HTTP_MAX_API_KEY), -EIO when the HTTP library refuses to
 * start. The server answers from its own threads until http_server_stop().
 */
int http_server_start(const struct http_config *cfg, int listen_fd, struct http_server **ret);

/* Stop accepting, close every connection (cancelling their generations in
 * kvd), free everything. Accepts NULL; returns NULL. */
struct http_server *http_server_stop(struct http_server *s);

#endif /* KVD_HTTP_SERVER_H */
