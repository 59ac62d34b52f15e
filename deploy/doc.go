// Package deploy holds what runs the gateway outside Go: the load balancer's
// configuration of docker-compose.yml (haproxy.cfg) and the container's
// health probe (probe/). Its tests check the repository's Dockerfile,
// docker-compose.yml and Helm chart against the flags and environment
// variables that the built services really accept.
package deploy
